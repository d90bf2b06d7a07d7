"""KServe tooling beside the manifests of kserve/: the storage bundle, the offline lint, the
manifests rendered by ``kubectl kustomize``, and the simulated pod the tests start."""
