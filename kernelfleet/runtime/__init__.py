"""The runtime: executes a validated plan across devices (DESIGN.md, the *place* half, step 6)."""
