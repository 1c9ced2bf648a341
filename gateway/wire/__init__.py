"""Wire shapes: request validation and response builders, no aiohttp here."""
