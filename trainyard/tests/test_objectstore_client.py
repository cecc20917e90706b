"""One S3 client per process for each store and options (kernel.objectstore.client), against the real store."""

import multiprocessing
import os

from kernel import objectstore


def _child_client_id(store, out) -> None:
    s3 = objectstore.client(store)
    s3.put_object(Bucket=store.bucket, Key=f"from-child-{os.getpid()}", Body=b"c")  # its own connections work
    out.put(id(s3))


def test_a_process_reuses_its_client_and_a_forked_child_makes_its_own(object_store):
    first = objectstore.client(object_store)
    assert objectstore.client(object_store) is first
    assert objectstore.client(object_store, timeout_s=5.0, attempts=1) is not first  # other options, another
    assert objectstore.client(object_store, sign_payload=False) is not first
    first.put_object(Bucket=object_store.bucket, Key="reused", Body=b"v")
    assert objectstore.client(object_store).get_object(Bucket=object_store.bucket, Key="reused")["Body"].read() == b"v"
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_client_id, args=(object_store, out))
    child.start()
    made_there = out.get(timeout=60)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert made_there != id(first)  # built in the child, not the parent's copy
    # Read by its name: a listing of the shared bucket answers 1,000 keys a page and other tests' keys sort first.
    written = first.get_object(Bucket=object_store.bucket, Key=f"from-child-{child.pid}")["Body"].read()
    assert written == b"c"
