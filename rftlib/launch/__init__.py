"""Launch an attempt as detached processes, watch it, stop it (issue 11): plan, supervise, status."""
