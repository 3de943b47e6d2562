"""HTTP layer, schemas, errors, configuration and the application builder."""
