"""The tasks an archive serves, one subpackage each (requests, engine, explanation, start);
``handler.tasks.registry`` lists them."""
