"""Scale-out on Ray: `minirt generate --ray ADDRESS --workers N` on Ray Data, and
`minirt serve --replicas N` on Ray Serve.

    ray_cluster.py      starting Ray, or joining a cluster, for both
    ray_data.py         Ray Data: a datasource of prompts files, one LLM per worker
    serve_on_ray.py     generate's side: checks, records in input order, the summary
    prompt_chunks.py    prompts files cut into chunks of whole lines, for readers in many processes
    engine_replica.py   Ray Serve: one replica (an engine thread), its streaming `serve_order`, and
                        the metrics board replicas report to
    replica_client.py   the ingress's engine client over the replicas (the server's app takes it
                        in place of the one-process client)
    prefix_router.py    the request router of --routing prefix
    serve_replicas.py   serve's side: Ray Serve started, the replicas deployed

Importing this folder does not import ray; the modules that do are listed in
tests/project/test_layout.py, and the commands import them only when asked for Ray.
"""
