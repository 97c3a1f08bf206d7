"""distbench test suite (a package, so rank processes can import test helpers)."""
