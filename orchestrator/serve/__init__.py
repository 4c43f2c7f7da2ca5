"""Ray Serve applications shipped with the orchestrator (the RayService in ``k8s/`` runs ``app``)."""
