"""The catalogue covers the interface document exactly."""

from membersync.extract import catalogue


def test_interface_counts() -> None:
    kinds = [e.kind for e in catalogue.ENDPOINTS]
    assert sum(k in ("config", "store") for k in kinds) == 13
    assert sum(k in ("client_read", "search") for k in kinds) == 11
    assert kinds.count("client_write") == 22
    assert kinds.count("user_write") == 3


def test_paths_are_unique_and_prefixed() -> None:
    paths = [e.path for e in catalogue.ENDPOINTS]
    assert len(paths) == len(set(paths))
    assert all(p.startswith("/svcapi/") for p in paths)
    assert catalogue.endpoint("insert_membership").path == "/svcapi/clients/insertMembership"
