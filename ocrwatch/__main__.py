from ocrwatch.cli import main

raise SystemExit(main())
