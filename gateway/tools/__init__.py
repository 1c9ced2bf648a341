"""The tools the gateway runs itself in the middle of an answer: web search and fetch, and the
tools of MCP servers (``hosted``: what they are; the rest of the package: who runs them)."""
