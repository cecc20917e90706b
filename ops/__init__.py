"""Operations: the embedded servers (`python -m ops.embedded`), the single-machine launcher (`make run`), the
process model, health checks, loop records, demo seeding. Below the Django configuration, above every app."""
