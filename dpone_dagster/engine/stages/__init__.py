"""The stages of a run, in the order engine/run.py calls them:

plan (boundary.py) → extract (extract.py) → bad records (bad_records.py) → gates (gates.py) →
shape (shape.py) → load (load.py) → commit (commit.py: deliveries confirmed, post-publish checks,
late records, the state; used by replication too).

Each stage is one function with typed inputs and outputs; nothing here decides the order.
"""
