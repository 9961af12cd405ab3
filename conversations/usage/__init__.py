"""Usage: daily aggregates filled as answers and API calls finish (``record``), their
figures for the pages (``figures``), server-side SVG charts with table fallbacks
(``charts``), the user's settings page and the admin's (``views``)."""
