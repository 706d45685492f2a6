"""A backend on another machine: `RemoteBackend` (the client), the service that serves a `LocalBackend`, and their wire format."""
