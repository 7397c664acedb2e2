//! Fuzzes the wire: the header decoder on every 80-byte window, and the frame parser
//! of a connection (`hcomm_transport::fuzzing::feed`) on the whole input, read in
//! pieces whose sizes come from the input too. Neither may panic, read out of
//! bounds, return a message of the wrong length or grow without bound.
//!
//!     cargo +nightly fuzz run frames fuzz/corpus/frames
#![no_main]

use hcomm_core::Header;
use hcomm_core::wire::HEADER_LEN;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else { return };
    // The first byte picks the peer rank (valid frames in the corpus come from rank 1)
    // and how the bytes arrive: whole, or in reads of 1..=16 bytes taken from the
    // next bytes.
    let peer = usize::from(ctl & 3);
    let (reads, body): (Vec<usize>, &[u8]) = if ctl & 4 == 0 {
        (Vec::new(), rest)
    } else {
        let k = rest.len().min(usize::from(ctl >> 3) + 1);
        (rest[..k].iter().map(|b| usize::from(b & 15) + 1).collect(), &rest[k..])
    };
    for w in body.windows(HEADER_LEN).step_by(7) {
        if let Ok(h) = Header::decode(w) {
            // A decoded header encodes back to the same bytes.
            assert_eq!(&h.encode()[..], w);
        }
    }
    let _ = hcomm_transport::fuzzing::feed(peer, body, &reads);
});
