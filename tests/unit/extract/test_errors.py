"""The typed error tree (``extract/errors.py``): its text names the endpoint and status and
never a secret; a body that is not JSON, a transport failure, pickling.
"""

from __future__ import annotations

import traceback

import httpx
import pytest
from client_doubles import PASSWORD, call_get, err, mock_client, run, scripted
from fake_time import FakeTime
from membersync.extract import errors


def test_error_text_names_endpoint_and_status_and_never_a_secret() -> None:
    t = FakeTime()
    token, account = "tok_live_9f8e7d6c", "000123456789"
    echo = f"tokenId {token} rejected for account {account}; auth was {PASSWORD}"
    handler, seen = scripted(err(400, "invalid_field", echo))
    with pytest.raises(errors.BadRequestError) as info:
        run(
            mock_client(handler, t).update_billing_info(
                clientNumber="000417",
                membershipId="M1",
                type="CARD",
                deductType="MONTHLY",
                tokenId=token,
                accountNo=account,
            )
        )
    error = info.value
    text = " ".join([str(error), repr(error), "".join(traceback.format_exception(error))])
    assert "update_billing_info" in str(error) and "HTTP 400" in str(error)
    assert "invalid_field" in str(error)
    assert error.field == "tokenId"
    for secret in (token, account, PASSWORD, seen[0].headers["authorization"].split()[1]):
        assert secret not in text
    assert error.__cause__ is None


def test_an_error_body_that_is_not_json_still_gives_a_typed_error() -> None:
    t = FakeTime()
    handler, _ = scripted(httpx.Response(404, content=b"<html><body>Not Found</body></html>"))
    with pytest.raises(errors.NotFoundError) as info:
        run(mock_client(handler, t).clientdetails("000999"))
    assert str(info.value) == "clientdetails: HTTP 404: NotFoundError"


def test_transport_errors_are_raised_without_their_cause() -> None:
    t = FakeTime()
    handler, _ = scripted(httpx.ConnectError("[Errno 111] Connection refused"))
    with pytest.raises(errors.ConnectError) as info:
        run(call_get(mock_client(handler, t, max_retries=0)))
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert info.value.status is None
    assert (
        str(info.value)
        == "storelist: no HTTP answer: could not connect (ConnectError: [Errno 111] Connection refused)"
    )


def test_errors_survive_pickling() -> None:
    import pickle

    error = errors.status_error("clientdetails", 409, b'{"error": {"code": "invalid_state", "message": "x"}}')
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.ConflictError and str(copy) == str(error) and copy.code == "invalid_state"
