"""The `baton` command line: up, down, status, model, deploy and the `baton bench` commands."""
