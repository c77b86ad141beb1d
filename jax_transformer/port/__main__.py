import sys

from jax_transformer.port.cli import main

sys.exit(main())
