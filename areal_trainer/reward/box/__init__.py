"""The box that runs generated code (``child.py``, its entry script, and the files it loads by path:
``namespaces.py``, ``landlock.py``, ``seccomp.py``, ``wire.py``). Every file here imports the standard
library only, so the box loads nothing of the trainer; the trainer's side of the wire is
``reward/judge.py``, and of the box's scratch directory ``reward/keeper.py``."""
