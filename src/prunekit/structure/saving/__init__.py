"""Saving compacted models with their shapes, and rebuilding them from the folder alone.

The last stage (trace -> groups -> score -> mask -> compensate -> compact -> save):
``saving`` holds ``save_compacted`` / ``load_compacted``, ``rebuild`` describes, plans,
applies and checks the shapes, ``skeleton`` builds a model without weights (and the registry
of factories), ``hfbuild`` the Hugging Face class and config of a save.
"""
