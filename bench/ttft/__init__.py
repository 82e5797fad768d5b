"""`baton bench ttft`: where one request's time to first token goes, per layout."""
