from ocrwatch.app.cli import main

raise SystemExit(main())
