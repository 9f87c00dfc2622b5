"""The command line: one module per command or small group, each holding its Typer options, its orchestration
and its rendering; cli.py assembles them into the app. The domain packages below (core, registry, builder,
check, measure, inspect, loop, report) return data and never import this layer."""
