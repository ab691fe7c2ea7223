"""What a run leaves on disk and resumes from: ``checkpoint.py`` (atomic save and load),
``manifest.py`` (file hashes that catch a damaged checkpoint), ``resume.py`` (which checkpoint, with
which settings).
"""
