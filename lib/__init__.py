"""Pure helpers every part may use: text and locale, per-loop clients, rate limiters, background
work. Nothing here imports kefu's own apps (an import-linter contract keeps it so)."""
