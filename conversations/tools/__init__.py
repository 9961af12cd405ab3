"""Tools through MCP: the client side (``client``), who may use which server and the tools a
conversation is offered (``registry``), and the site's own harmless server
(``builtin_server``, with ``calculator`` and ``search``)."""
