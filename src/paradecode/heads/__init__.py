"""Trained draft heads (EAGLE, Medusa): the modules, and saving / loading / checking them (``store``)."""
