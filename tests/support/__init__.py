"""What the test layers share: helpers, fixtures, task factories and the scripts the tests launch.
Test files import from here, never from each other."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root folder."""
SCRIPTS = Path(__file__).resolve().parent / "scripts"
"""Training scripts and small projects the tests launch as a user would."""
