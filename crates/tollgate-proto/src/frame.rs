//! The Unix-socket framing: a 4-byte big-endian length, then that many bytes of one
//! protobuf `Envelope`. Frames longer than [`MAX_FRAME_LEN`] are refused before their body
//! is read.

use prost::Message;

use crate::sp1::Envelope;

/// The largest frame body accepted or sent: 1 MiB (SP/1.0 §7.4).
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 4;

/// A frame that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header announces more than [`MAX_FRAME_LEN`] bytes.
    #[error("frame of {len} bytes is over the limit of {max}")]
    TooLarge {
        /// The announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The body is not a protobuf `Envelope`.
    #[error("malformed envelope: {0}")]
    Malformed(String),
}

/// The body length a header announces, if acceptable.
pub fn body_len(header: [u8; HEADER_LEN]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
    if len_usize > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max: MAX_FRAME_LEN,
        });
    }
    Ok(len_usize)
}

/// Frame already-encoded envelope bytes: header then body.
pub fn frame_bytes(body: &[u8]) -> Result<Vec<u8>, FrameError> {
    if body.len() > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            len: body.len() as u64,
            max: MAX_FRAME_LEN,
        });
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge {
        len: body.len() as u64,
        max: MAX_FRAME_LEN,
    })?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

/// Encode and frame an envelope (unauthenticated; see [`crate::auth`] to seal one).
pub fn encode(envelope: &Envelope) -> Result<Vec<u8>, FrameError> {
    frame_bytes(&envelope.encode_to_vec())
}

/// Decode one frame body.
pub fn decode_envelope(body: &[u8]) -> Result<Envelope, FrameError> {
    if body.len() > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            len: body.len() as u64,
            max: MAX_FRAME_LEN,
        });
    }
    Envelope::decode(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// An incremental frame splitter over a byte stream: push what arrived, pop whole frame
/// bodies. Bounded: it never holds more than one header and one maximal body.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Append received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame body, `None` if more bytes are needed, or an error for a header
    /// announcing an oversize body (the stream cannot be resynchronised after that: close it).
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(header);
        let len = body_len(h)?;
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let body = self
            .buf
            .get(HEADER_LEN..HEADER_LEN + len)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(body))
    }

    /// Bytes held that do not yet make a whole frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sp1::{envelope::Payload, Heartbeat};

    fn heartbeat() -> Envelope {
        Envelope {
            protocol_version: "1.0.0".into(),
            message_id: "m1".into(),
            payload: Some(Payload::Heartbeat(Heartbeat {
                session_id: "s".into(),
                last_call_number: 3,
                local_budget_remaining: 0.5,
            })),
            ..Envelope::default()
        }
    }

    #[test]
    fn round_trip_through_a_split_stream() {
        let a = encode(&heartbeat()).unwrap();
        let mut stream = a.clone();
        stream.extend_from_slice(&a);
        let mut d = FrameDecoder::new();
        let mut frames = Vec::new();
        for chunk in stream.chunks(3) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(decode_envelope(&f).unwrap());
            }
        }
        assert_eq!(frames, vec![heartbeat(), heartbeat()]);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn oversize_headers_are_refused_before_the_body() {
        assert_eq!(
            body_len((MAX_FRAME_LEN as u32).to_be_bytes()).unwrap(),
            MAX_FRAME_LEN
        );
        assert_eq!(
            body_len((MAX_FRAME_LEN as u32 + 1).to_be_bytes()),
            Err(FrameError::TooLarge {
                len: MAX_FRAME_LEN as u64 + 1,
                max: MAX_FRAME_LEN
            })
        );
        let mut d = FrameDecoder::new();
        d.push(&u32::MAX.to_be_bytes());
        assert!(matches!(d.next_frame(), Err(FrameError::TooLarge { .. })));
        assert!(frame_bytes(&vec![0u8; MAX_FRAME_LEN + 1]).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode_envelope(&[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(decode_envelope(&[0x0a, 0x05, b'a']).is_err());
        assert_eq!(decode_envelope(&[]).unwrap(), Envelope::default());
    }
}
