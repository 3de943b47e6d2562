import sys

from bench.ingestion.run import main

sys.exit(main())
