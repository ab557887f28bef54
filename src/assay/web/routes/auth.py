"""Signing in and out, accepting an invitation, setting a new password through a reset link, and the account
page with its API tokens.

A refused sign-in is rendered (403: another site's form or no form token; 429 + Retry-After: throttled or
every hashing slot busy; 401: wrong name or password), not raised, so the request still commits the
throttle's counts and the audit trail (``assay.web.throttle``, ``assay.web.signin``). After a successful
login the old session (if any) ends and a new token is issued, so a token planted before login (session
fixation) is worthless.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.store.web_models import WebPasswordReset, WebUser
from assay.web import accounts, audit, signin
from assay.web.routes import Area, redirect, render, safe_next
from assay.web.security import (
    SESSION_COOKIE,
    CurrentUser,
    DbSession,
    OptionalUser,
    clear_session_cookie,
    set_session_cookie,
)

router = APIRouter(include_in_schema=False)
AREAS = [Area("Account", "/account", description="Your roles and API tokens.", order=900)]
Username = Annotated[str, Form(max_length=200)]
Password = Annotated[str, Form(max_length=1000)]


def _sign_in(request: Request, session: Session, user: WebUser, to: str) -> Response:
    """Redirect to ``to`` as ``user``: the browser's old session (if any) ends and a new token is issued."""
    accounts.end_session(session, request.cookies.get(SESSION_COOKIE))
    response = redirect(to)
    set_session_cookie(request, response, accounts.start_session(session, user))
    return response


def _same(password: str, password_again: str) -> str:
    if password != password_again:
        raise UserError("the two passwords differ")
    return password


def _login_page(
    request: Request, status_code: int = 200, headers: dict[str, str] | None = None, **context: object
) -> Response:
    """The sign-in form with a pre-session token (cookie and hidden field: ``signin.login_form_token``)."""
    token = signin.login_form_token(request)
    response = render(request, "login.html", status_code, headers, login_token=token, **context)
    signin.set_login_cookie(request, response, token)
    return response


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, user: OptionalUser, next: str = "/") -> Response:
    if user is not None:
        return redirect(safe_next(next))
    return _login_page(request, next=safe_next(next))


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    session: DbSession,
    username: Username,
    password: Password,
    next: Annotated[str, Form()] = "/",
    login_token: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    """Refusals are rendered, not raised, so the request still commits the throttle's counts and audit."""
    again = {"next": safe_next(next), "username": username}
    problem = signin.login_post_problem(request, login_token)
    if problem is not None:
        audit.record(session, None, "signin.origin", username[:200], f"from {signin.client_address(request)}")
        return _login_page(request, 403, error=problem, **again)
    try:
        user = accounts.authenticate(
            session,
            username,
            password,
            client=signin.client_address(request),
            device=request.cookies.get(signin.DEVICE_COOKIE),
        )
    except (accounts.Throttled, accounts.Busy) as err:
        return _login_page(request, 429, {"Retry-After": str(err.retry_after)}, error=err, **again)
    except accounts.LoginFailed as err:
        return _login_page(request, 401, error=err, **again)
    response = _sign_in(request, session, user, safe_next(next))
    device = accounts.remember_device(session, user, request.cookies.get(signin.DEVICE_COOKIE))
    if device is not None:
        signin.set_device_cookie(request, response, device)
    response.delete_cookie(signin.LOGIN_COOKIE, path="/")
    return response


@router.post("/logout")
def logout(request: Request, session: DbSession, user: OptionalUser) -> Response:
    accounts.end_session(session, request.cookies.get(SESSION_COOKIE))
    response = redirect("/login")
    clear_session_cookie(request, response)
    return response


@router.get("/invite/{token}", response_class=HTMLResponse)
def invite_page(request: Request, session: DbSession, user: OptionalUser, token: str) -> Response:
    invitation = accounts.open_invitation(session, token)  # UserError: the error page says why
    return render(request, "invite.html", token=token, invitation=invitation)


@router.post("/invite/{token}", response_class=HTMLResponse)
def accept_invite(
    request: Request,
    session: DbSession,
    user: OptionalUser,
    token: str,
    username: Username,
    password: Password,
    password_again: Password,
) -> Response:
    invitation = accounts.open_invitation(session, token)
    try:
        new_user = accounts.accept_invitation(session, token, username, _same(password, password_again))
    except UserError as err:
        session.rollback()  # nothing half-made: the user row, if flushed, goes
        return render(
            request,
            "invite.html",
            status_code=400,
            token=token,
            invitation=invitation,
            username=username,
            error=err,
        )
    return _sign_in(request, session, new_user, "/")


def _reset_user(session: Session, reset: WebPasswordReset) -> WebUser:
    """Whose password the link sets: the page names them, so nobody sets a password for the wrong account."""
    return session.get_one(WebUser, reset.user_id)


@router.get("/reset/{token}", response_class=HTMLResponse)
def reset_page(request: Request, session: DbSession, user: OptionalUser, token: str) -> Response:
    reset = accounts.open_password_reset(session, token)  # UserError: the error page says why
    return render(request, "reset.html", token=token, reset=reset, target=_reset_user(session, reset))


@router.post("/reset/{token}", response_class=HTMLResponse)
def reset_password(
    request: Request,
    session: DbSession,
    user: OptionalUser,
    token: str,
    password: Password,
    password_again: Password,
    keep_tokens: Annotated[bool, Form()] = False,
) -> Response:
    """A used link ends every session of its user and, unless they keep them, revokes their API tokens; the
    browser that used it is signed in afresh."""
    reset = accounts.open_password_reset(session, token)
    target = _reset_user(session, reset)
    try:
        accounts.use_password_reset(session, token, _same(password, password_again), keep_tokens=keep_tokens)
    except UserError as err:
        session.rollback()
        return render(request, "reset.html", 400, token=token, reset=reset, target=target, error=err)
    return _sign_in(request, session, target, "/")


def _account_page(request: Request, session: DbSession, user: CurrentUser, **extra: object) -> Response:
    return render(
        request,
        "account.html",
        tokens=accounts.list_api_tokens(session, user),
        participants=accounts.participants_of(session, user),
        **extra,
    )


@router.get("/account", response_class=HTMLResponse)
def account(request: Request, session: DbSession, user: CurrentUser) -> Response:
    return _account_page(request, session, user)


@router.post("/account/tokens", response_class=HTMLResponse)
def new_token(
    request: Request, session: DbSession, user: CurrentUser, name: Annotated[str, Form(max_length=200)]
) -> Response:
    """The new token is shown once, on this response; the database keeps only its hash."""
    try:
        raw = accounts.create_api_token(session, user, name)
    except UserError as err:
        session.rollback()
        return _account_page(request, session, user, error=err)
    return _account_page(request, session, user, new_token=raw, new_token_name=name.strip())


@router.post("/account/tokens/{token_id}/revoke")
def revoke_token(request: Request, session: DbSession, user: CurrentUser, token_id: int) -> Response:
    accounts.revoke_api_token(session, user, token_id)
    return redirect("/account")
