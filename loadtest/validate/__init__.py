"""``mtgate validate``: one verdict (PROMOTE or REJECT) from a package's integrity, its quality against a baseline, its
load targets, its cost and, with ``--shadow-log``, live traffic. ``command`` runs it; ``speed``, ``cost`` and
``shadow`` measure; ``report`` writes it."""
