"""Lines the overlay logs at start-up when a served CPU leg runs the series' exact path."""

EXACT_ON = "XPU Laguna exact verify: ON"
PREBUILT_ON = "XPU Laguna prebuilt exact-verify metadata: ON"
