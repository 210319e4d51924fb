"""``python -m torchtree``."""
import sys

from torchtree.cli import main

sys.exit(main())
