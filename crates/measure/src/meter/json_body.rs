//! A non-streaming response body, kept to be inspected at its end.

use bytes::Bytes;

use super::MAX_JSON_BODY;

/// The body so far. A body that comes in one frame (a JSON answer usually does) is that frame,
/// shared with what the client is handed (a reference count); only a body of several frames
/// is copied together.
#[derive(Debug, Default)]
pub(super) enum JsonBody {
    #[default]
    Empty,
    One(Bytes),
    Joined(Vec<u8>),
    /// Past [`MAX_JSON_BODY`]: not inspected, nothing kept.
    Overflow,
}

impl JsonBody {
    /// The next frame's bytes; `shared` is the same bytes when the caller has them as
    /// [`Bytes`] (kept by reference count when the body is one frame).
    pub(super) fn push(&mut self, data: &[u8], shared: Option<&Bytes>) {
        let len = self.bytes().len() + data.len();
        if len > MAX_JSON_BODY {
            *self = JsonBody::Overflow;
            return;
        }
        *self = match std::mem::take(self) {
            JsonBody::Empty => match shared {
                Some(b) => JsonBody::One(b.clone()),
                None => JsonBody::Joined(data.to_vec()),
            },
            JsonBody::One(first) => {
                let mut all = Vec::with_capacity(len);
                all.extend_from_slice(&first);
                all.extend_from_slice(data);
                JsonBody::Joined(all)
            }
            JsonBody::Joined(mut all) => {
                all.extend_from_slice(data);
                JsonBody::Joined(all)
            }
            JsonBody::Overflow => JsonBody::Overflow,
        };
    }

    pub(super) fn overflowed(&self) -> bool {
        matches!(self, JsonBody::Overflow)
    }

    /// The bytes so far (none once overflowed).
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            JsonBody::Empty | JsonBody::Overflow => &[],
            JsonBody::One(b) => b,
            JsonBody::Joined(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split anywhere, shared or copied, the body is the bytes pushed, in order.
    #[test]
    fn the_body_is_its_frames_in_order_however_they_came() {
        let text: &[u8] = br#"{"choices":[{"index":0,"finish_reason":"stop"}]}"#;
        for cut in 0..=text.len() {
            for shared in [false, true] {
                let mut body = JsonBody::default();
                for part in [&text[..cut], &text[cut..]] {
                    let b = Bytes::copy_from_slice(part);
                    body.push(part, shared.then_some(&b));
                }
                assert_eq!(body.bytes(), text, "cut {cut} shared {shared}");
                assert!(!body.overflowed());
            }
        }
        let mut one = JsonBody::default();
        one.push(text, Some(&Bytes::from_static(text)));
        assert!(
            matches!(one, JsonBody::One(_)),
            "one frame is kept, not copied"
        );
    }

    #[test]
    fn past_the_limit_nothing_is_kept_and_it_stays_so() {
        let mut body = JsonBody::default();
        body.push(&vec![b' '; MAX_JSON_BODY], None);
        assert_eq!(body.bytes().len(), MAX_JSON_BODY);
        body.push(b"x", None);
        assert!(body.overflowed());
        assert!(body.bytes().is_empty());
        body.push(b"", None);
        assert!(body.overflowed());
    }
}
