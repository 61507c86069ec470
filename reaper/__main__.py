from reaper.cli import main

raise SystemExit(main())
