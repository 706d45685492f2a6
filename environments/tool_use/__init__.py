"""A tool-using agent whose answers need its tools' results: arithmetic, a price lookup, unit conversion."""
