"""stampede's tests, laid out as the package is (see ARCHITECTURE.md)."""
