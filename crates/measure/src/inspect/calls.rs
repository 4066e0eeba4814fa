//! What the one pass notes about tool calls: each entry of a choice's
//! `delta.tool_calls` (streams) or `message.tool_calls` (a non-streaming body), so that the
//! agent meter ([`crate::agent::AgentMeter`]) assembles calls without parsing the event again.
//! Names and argument fragments are byte spans of the payload ([`Span`]), decoded only by
//! whoever appends them to a call ([`Span::text`]).
//!
//! Readings (the differential test holds them against a `serde_json::Value` of the payload):
//! `tool_calls` is read when it is an array (anything else logs nothing, and counts as output
//! by the usual emptiness rule); each element is a call when it is an object whose `index` is
//! absent (0) or an integer of `u32` (a message's calls: the position in the array, any
//! `index` ignored), and whose `function` is absent, `null`, or an object whose `name` and
//! `arguments` are each absent, `null` or a string; an element of any other shape is not a
//! call (the rest of the event still counts). A repeated key counts by its last value.

use crate::scan::{Cursor, Malformed, Scan};

use super::tokens::{decoded_len, Span};

/// One entry of a choice's `tool_calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedCall {
    /// The choice's `index`.
    pub choice: u32,
    /// The call's `index` (a message's calls: the position).
    pub index: u32,
    /// It carries an `id` that is not `null` (vLLM: the call's opening delta).
    pub id: bool,
    /// `function.name` (a fragment of it, in principle).
    pub name: Option<Span>,
    /// `function.arguments`: this delta's fragment of the arguments.
    pub arguments: Option<Span>,
}

/// `tool_calls` (not yet consumed): whether it carries output (as [`Cursor::non_empty`]
/// says), and the decoded length of its names and argument fragments; when `calls` is given,
/// the calls are pushed there (`choice` 0: the caller sets it once the choice's `index` is
/// read). `positional`: a message's calls, indexed by their position.
pub(super) fn read_tool_calls(
    c: &mut Cursor<'_>,
    lead: usize,
    mut calls: Option<&mut Vec<LoggedCall>>,
    positional: bool,
) -> Scan<(bool, u32)> {
    if c.peek() != Some(b'[') {
        return c.non_empty().map(|n| (n, 0));
    }
    let (mut n, mut len) = (0u32, 0u32);
    c.array(|c| {
        let at = n;
        n = n.saturating_add(1);
        if c.peek() != Some(b'{') {
            return c.skip();
        }
        let (index, call, this) = read_call(c, lead)?;
        len = len.saturating_add(this);
        let index = if positional { Ok(at) } else { index };
        if let (Some(calls), Ok(index), Ok(call)) = (calls.as_deref_mut(), index, call) {
            calls.push(LoggedCall { index, ..call });
        }
        Ok(())
    })?;
    Ok((n > 0, len))
}

/// One element that is an object: its `index` and the rest of the call it is (`Err` when it
/// is not one), and the decoded length of its `function`'s name and arguments (strings only;
/// the trace's text length).
fn read_call(c: &mut Cursor<'_>, lead: usize) -> Scan<(Scan<u32>, Scan<LoggedCall>, u32)> {
    let mut index: Scan<u32> = Ok(0);
    let mut id = false;
    let mut function: Scan<[Option<Span>; 2]> = Ok([None; 2]);
    let mut len = 0u32;
    c.object(|c, key| {
        match key.one_of(&[b"index", b"id", b"function"]) {
            Some(0) => index = c.read_or_skip(super::read_index)?,
            Some(1) => id = !c.null() && c.skip().map(|()| true)?,
            Some(2) => (function, len) = read_function(c, lead)?,
            _ => c.skip()?,
        }
        Ok(())
    })?;
    let call = function.map(|[name, arguments]| LoggedCall {
        choice: 0,
        index: 0,
        id,
        name,
        arguments,
    });
    Ok((index, call, len))
}

/// `function`: `null` or an object of `name` and `arguments` (each `null` or a string).
fn read_function(c: &mut Cursor<'_>, lead: usize) -> Scan<(Scan<[Option<Span>; 2]>, u32)> {
    if c.null() {
        return Ok((Ok([None; 2]), 0));
    }
    if c.peek() != Some(b'{') {
        return c.skip().map(|()| (Err(Malformed), 0));
    }
    let mut fields: [Scan<Option<Span>>; 2] = [Ok(None); 2];
    let mut lens = [0u32; 2];
    c.object(|c, key| {
        match key.one_of(&[b"name", b"arguments"]) {
            Some(k) => (fields[k], lens[k]) = text(c, lead)?,
            None => c.skip()?,
        }
        Ok(())
    })?;
    let [name, arguments] = fields;
    let texts = name.and_then(|n| Ok([n, arguments?]));
    Ok((texts, lens[0].saturating_add(lens[1])))
}

/// A string (its span and decoded length), `null` (none), or another value (refused, skipped).
fn text(c: &mut Cursor<'_>, lead: usize) -> Scan<(Scan<Option<Span>>, u32)> {
    match c.peek() {
        Some(b'"') => {
            let s = c.string()?;
            let len = if s.escaped() {
                decoded_len(s.raw())
            } else {
                s.raw().len()
            };
            Ok((Ok(Some(Span::of(c, s, lead))), len as u32))
        }
        _ if c.null() => Ok((Ok(None), 0)),
        _ => c.skip().map(|()| (Err(Malformed), 0)),
    }
}
