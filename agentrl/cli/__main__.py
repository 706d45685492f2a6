"""`python -m agentrl.cli`: the `agentrl` command."""

from agentrl.cli.app import main

if __name__ == "__main__":
    main()
