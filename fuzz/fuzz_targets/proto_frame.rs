//! Control frames from a hostile client: decode never panics, and whatever
//! decodes re-encodes to a frame that decodes to the same message.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, msg)) = wd_proto::decode_frame(data) {
        let again = wd_proto::encode(&msg, h.request_id).expect("decoded messages encode");
        let (_, back) = wd_proto::decode_frame(&again).expect("encoded messages decode");
        assert_eq!(back, msg);
    }
});
