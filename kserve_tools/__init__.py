"""KServe tooling beside the manifests of kserve/: the storage bundle and the offline lint."""
