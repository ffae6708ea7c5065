"""The workbench dashboard: a multi-page Dash app over the run store.

``app.py`` builds the app, ``pages/`` holds one view per file (each calls
``dash.register_page``, so adding a page is adding a file), and ``components/`` holds the
figures and controls the pages share. Pages only read what runs wrote; none loads a model.
"""
