"""End-to-end demos of the library (`tcsm demo <name>`)."""
