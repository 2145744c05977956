"""Data files shipped with paradecode: calibration text, measured quality figures."""
