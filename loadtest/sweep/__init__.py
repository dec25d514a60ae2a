"""``mtgate sweep``: serving configurations measured against the same targets, and the cheapest that meets them all.
``config`` reads the sweep file; ``command`` runs its points (resumable); ``results`` chooses; ``report`` writes it."""
