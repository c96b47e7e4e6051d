"""The dashboard: server-rendered pages (Jinja2 templates, vendored htmx) under /ui on
the API's app, signed in with a user name and password or an API token."""
