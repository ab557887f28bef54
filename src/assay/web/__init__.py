"""assay.web: the web face (FastAPI): server-rendered pages, a JSON API under /api/v1, accounts and roles.

Start it with ``assay serve``; build it in code with ``assay.web.app.create_app``.
"""
