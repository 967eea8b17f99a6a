"""Scale-out on Ray Data: `minirt generate --ray ADDRESS --workers N`.

    ray_data.py       the only module that imports ray: a datasource of prompts files, one LLM
                      per worker
    serve_on_ray.py   the command's side: checks, records in input order, the summary
    prompt_chunks.py  prompts files cut into chunks of whole lines, for readers in many processes

Importing this folder does not import ray; only ray_data.py does (tests/project/test_layout.py
holds this).
"""
