"""The objective and the screening of peers' samples."""
