from scripts.cli import main

raise SystemExit(main())
