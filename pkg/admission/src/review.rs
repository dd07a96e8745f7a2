//! Decoding `AdmissionReview` requests and encoding the answers.
//!
//! What a client gets back for a malformed body:
//!
//! | body                                                     | answer |
//! |----------------------------------------------------------|--------|
//! | not JSON, or JSON that is not an object                  | `400` with a `text/plain` reason: there is no review to answer |
//! | JSON object whose `kind` is not `AdmissionReview`        | `200` AdmissionReview, `response` = [`AdmissionResponse::invalid`] |
//! | `apiVersion` other than `admission.k8s.io/v1` (e.g. `v1beta1`) | `200`, invalid, reason names the version and the fix |
//! | `request` missing or `null`                              | `200`, invalid |
//! | `request` present but not decodable (missing `uid`, unknown `operation`, ...) | `200`, invalid, reason carries the field path |
//! | `request.uid` empty                                      | `200`, invalid |
//!
//! Every `200` answer is an `admission.k8s.io/v1` `AdmissionReview` whose `response.uid` is
//! the request's uid when one could be read (a string at `request.uid`), and empty otherwise.
//! "Invalid" answers have `allowed: false` and `status.reason: InvalidRequest`, so the API
//! server refuses the object with a readable message instead of a transport error.
//!
//! On typed routes ([`Route::validating_typed`](crate::Route::validating_typed) and the like)
//! `request.object` and `request.oldObject` are taken out as sent before the review is decoded
//! and then decoded as the route's type; one that does not fit is a handler failure, answered
//! by the route's [`OnHandlerError`](crate::OnHandlerError) policy with the field path.

use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
};
use kube::core::{DynamicObject, TypeMeta};
use serde::Deserialize;
use serde_json::Value;

use crate::patch::json_type;
use crate::route::{RawObjects, Review};

/// Why a body did not yield an [`AdmissionRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeRejection {
    /// No review could be read at all; answered with HTTP 400 and this text.
    NotAReview(String),
    /// A review-shaped body that we refuse; answered with HTTP 200 and
    /// [`AdmissionResponse::invalid`] carrying `reason`, with `uid` copied when known.
    Invalid {
        /// `request.uid` if the body had one, else empty.
        uid: String,
        /// Human-readable reason, shown to whoever created the object.
        reason: String,
    },
}

/// Decodes an `admission.k8s.io/v1` `AdmissionReview` body into its request.
///
/// The returned request carries the review's `TypeMeta`, so
/// `AdmissionResponse::from(&request)` copies the uid and version correctly.
pub fn decode_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, DecodeRejection> {
    decode_review_parts(body, false).map(|review| review.request)
}

/// [`decode_review`], and with `take_objects` the raw `request.object` and `request.oldObject`
/// as sent, taken out before decoding (the request then carries neither as a
/// [`DynamicObject`]), for typed routes: a [`DynamicObject`] reads `metadata` as `ObjectMeta`,
/// which drops unknown metadata fields and normalises others.
pub(crate) fn decode_review_parts(
    body: &[u8],
    take_objects: bool,
) -> Result<Review, DecodeRejection> {
    let mut value: Value = serde_json::from_slice(body).map_err(|err| {
        DecodeRejection::NotAReview(format!(
            "the request body is not JSON ({err}); expected an admission.k8s.io/v1 AdmissionReview"
        ))
    })?;
    let Value::Object(object) = &value else {
        return Err(DecodeRejection::NotAReview(format!(
            "the request body is a JSON {}, not an object; expected an admission.k8s.io/v1 \
             AdmissionReview",
            json_type(&value)
        )));
    };

    let uid = object
        .get("request")
        .and_then(|request| request.get("uid"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let invalid = |reason: String| DecodeRejection::Invalid {
        uid: uid.clone(),
        reason,
    };

    match object.get("kind") {
        Some(Value::String(kind)) if kind == META_KIND => {}
        Some(Value::String(kind)) => {
            return Err(invalid(format!(
                "kind is {kind:?}; this webhook only accepts {META_KIND:?}"
            )));
        }
        Some(other) => {
            return Err(invalid(format!(
                "kind must be the string {META_KIND:?}, got a JSON {}",
                json_type(other)
            )));
        }
        None => return Err(invalid(format!("kind is missing; expected {META_KIND:?}"))),
    }
    match object.get("apiVersion") {
        Some(Value::String(version)) if version == META_API_VERSION_V1 => {}
        Some(Value::String(version)) => {
            return Err(invalid(format!(
                "apiVersion is {version:?}; this webhook only speaks {META_API_VERSION_V1:?} \
                 (list only \"v1\" in the webhook's admissionReviewVersions)"
            )));
        }
        Some(other) => {
            return Err(invalid(format!(
                "apiVersion must be the string {META_API_VERSION_V1:?}, got a JSON {}",
                json_type(other)
            )));
        }
        None => {
            return Err(invalid(format!(
                "apiVersion is missing; expected {META_API_VERSION_V1:?}"
            )));
        }
    }
    match object.get("request") {
        None | Some(Value::Null) => {
            return Err(invalid(
                "the AdmissionReview has no request to review".to_owned(),
            ));
        }
        Some(_) => {}
    }

    let mut raw = RawObjects::default();
    if take_objects && let Some(Value::Object(request)) = value.get_mut("request") {
        raw.object = request
            .get_mut("object")
            .map(Value::take)
            .filter(|v| !v.is_null());
        raw.old_object = request
            .get_mut("oldObject")
            .map(Value::take)
            .filter(|v| !v.is_null());
    }
    // Decoding is deterministic: a review that decodes does so without tracking the path, and
    // one that does not is decoded again with it, for the message.
    let review: AdmissionReview<DynamicObject> = match AdmissionReview::deserialize(&value) {
        Ok(review) => review,
        Err(_) => serde_path_to_error::deserialize(&value).map_err(|err| {
            let path = err.path().to_string();
            invalid(format!(
                "the AdmissionReview cannot be decoded at {path}: {}",
                err.into_inner()
            ))
        })?,
    };
    let request: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| invalid("the AdmissionReview has no request to review".to_owned()))?;
    if request.uid.is_empty() {
        return Err(invalid("request.uid is empty".to_owned()));
    }
    Ok(Review { request, raw })
}

/// An [`AdmissionResponse::invalid`] carrying `uid` (which may be empty when unknown).
pub fn invalid_response(uid: &str, reason: impl ToString) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid(reason);
    response.uid = uid.to_owned();
    response
}

/// Wraps `response` in an `admission.k8s.io/v1` `AdmissionReview`, whatever `TypeMeta` the
/// response carries.
pub fn into_v1_review(response: AdmissionResponse) -> AdmissionReview<DynamicObject> {
    AdmissionReview {
        types: TypeMeta {
            api_version: META_API_VERSION_V1.to_owned(),
            kind: META_KIND.to_owned(),
        },
        request: None,
        response: Some(response),
    }
}

/// Encodes `response` as an `admission.k8s.io/v1` `AdmissionReview`, as [`into_v1_review`]
/// and `serde_json` write it but for the patch: written as base64 text, the JSON form of Go's
/// `[]byte` the API server reads it as (kube writes the bytes as a list of numbers, which the
/// API server also accepts, at about three times the size of base64 and many times its cost).
pub(crate) fn encode_review(response: AdmissionResponse) -> Result<Vec<u8>, serde_json::Error> {
    let mut review = into_v1_review(response);
    let Some(patch) = review.response.as_mut().and_then(|r| r.patch.take()) else {
        return serde_json::to_vec(&review);
    };
    // One buffer, sized for the review around the patch: the review without it, then the
    // patch's base64 text written into its place.
    let mut out = Vec::with_capacity(patch.len().div_ceil(3) * 4 + 1024);
    serde_json::to_writer(&mut out, &review)?;
    // The patch goes where kube writes it, before `patchType` (a key: inside a JSON string the
    // quotes would be escaped, so this text is the key's first occurrence).
    const PATCH_TYPE: &[u8] = b",\"patchType\":";
    let Some(at) = out.windows(PATCH_TYPE.len()).position(|w| w == PATCH_TYPE) else {
        // A patch without a type: written as kube writes it.
        if let Some(response) = review.response.as_mut() {
            response.patch = Some(patch);
        }
        return serde_json::to_vec(&review);
    };
    let tail = out.split_off(at);
    out.extend_from_slice(b",\"patch\":\"");
    // The JSON form of Go's `[]byte` (k8s-openapi's `ByteString`): standard base64 with
    // padding, whose characters need no escaping in a JSON string.
    let start = out.len();
    out.resize(
        start + base64::encoded_len(patch.len(), true).unwrap_or(0),
        0,
    );
    match base64::Engine::encode_slice(
        &base64::engine::general_purpose::STANDARD,
        &patch,
        &mut out[start..],
    ) {
        Ok(written) => out.truncate(start + written),
        Err(_) => {
            // Not expected (the buffer is sized for it): written as kube writes it.
            if let Some(response) = review.response.as_mut() {
                response.patch = Some(patch);
            }
            return serde_json::to_vec(&review);
        }
    }
    out.push(b'"');
    out.extend_from_slice(&tail);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review(request: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    }

    fn pod_request() -> Value {
        json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
            "oldObject": null,
            "dryRun": false
        })
    }

    fn decode(value: &Value) -> Result<AdmissionRequest<DynamicObject>, DecodeRejection> {
        decode_review(&serde_json::to_vec(value).unwrap())
    }

    fn invalid_reason(
        result: Result<AdmissionRequest<DynamicObject>, DecodeRejection>,
    ) -> (String, String) {
        match result {
            Err(DecodeRejection::Invalid { uid, reason }) => (uid, reason),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn decodes_a_v1_review() {
        let request = decode(&review(pod_request())).unwrap();
        assert_eq!(request.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(request.kind.kind, "Pod");
        assert_eq!(request.types.api_version, META_API_VERSION_V1);
        let response = AdmissionResponse::from(&request);
        assert_eq!(response.uid, request.uid);
    }

    #[test]
    fn not_json_is_not_a_review() {
        assert!(matches!(
            decode_review(b"{not json"),
            Err(DecodeRejection::NotAReview(reason)) if reason.contains("not JSON")
        ));
        assert!(matches!(
            decode_review(b"[1,2]"),
            Err(DecodeRejection::NotAReview(reason)) if reason.contains("array")
        ));
    }

    #[test]
    fn wrong_kind_and_version_are_invalid_with_uid() {
        let mut body = review(pod_request());
        body["kind"] = json!("ConfigMap");
        let (uid, reason) = invalid_reason(decode(&body));
        assert_eq!(uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert!(reason.contains("ConfigMap"), "{reason}");

        let mut body = review(pod_request());
        body["apiVersion"] = json!("admission.k8s.io/v1beta1");
        let (uid, reason) = invalid_reason(decode(&body));
        assert_eq!(uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert!(reason.contains("v1beta1"), "{reason}");

        let mut body = review(pod_request());
        body.as_object_mut().unwrap().remove("apiVersion");
        let (_, reason) = invalid_reason(decode(&body));
        assert!(reason.contains("apiVersion is missing"), "{reason}");
    }

    #[test]
    fn missing_request_is_invalid_without_uid() {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        let (uid, reason) = invalid_reason(decode(&body));
        assert_eq!(uid, "");
        assert!(reason.contains("no request"), "{reason}");
        let (_, reason) = invalid_reason(decode(&review(Value::Null)));
        assert!(reason.contains("no request"), "{reason}");
    }

    #[test]
    fn undecodable_request_names_the_field() {
        let mut request = pod_request();
        request["operation"] = json!("EXPLODE");
        let (uid, reason) = invalid_reason(decode(&review(request)));
        assert_eq!(uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert!(reason.contains("request.operation"), "{reason}");

        let mut request = pod_request();
        request["uid"] = json!("");
        let (_, reason) = invalid_reason(decode(&review(request)));
        assert!(reason.contains("uid is empty"), "{reason}");
    }

    #[test]
    fn the_patch_is_written_as_base64_where_kube_writes_it() {
        use json_patch::{AddOperation, Patch, PatchOperation};
        for text in ["", "a", "ab", "abc", "abcd", "\u{e9}t\u{e9} \"quoted\""] {
            let mut path = json_patch::jsonptr::PointerBuf::new();
            path.push_back("metadata");
            let patch = Patch(vec![PatchOperation::Add(AddOperation {
                path,
                value: json!({"x": text}),
            })]);
            // Messages and warnings holding the key's text, which must not be taken for it.
            let mut response = invalid_response("u", "\",\"patchType\":\"x\"");
            response.allowed = true;
            response.warnings = Some(vec![",\"patchType\":".to_owned()]);
            let response = response.with_patch(patch).unwrap();
            let bytes = response.patch.clone().unwrap();
            let ours: Value =
                serde_json::from_slice(&encode_review(response.clone()).unwrap()).unwrap();
            let kubes = serde_json::to_value(into_v1_review(response)).unwrap();
            // The same review but for the patch's form; the same bytes in it.
            let mut without = ours.clone();
            without["response"].as_object_mut().unwrap().remove("patch");
            let mut kube_without = kubes.clone();
            kube_without["response"]
                .as_object_mut()
                .unwrap()
                .remove("patch");
            assert_eq!(without, kube_without);
            let encoded = ours["response"]["patch"].as_str().unwrap();
            assert_eq!(
                serde_json::from_value::<k8s_openapi::ByteString>(json!(encoded))
                    .unwrap()
                    .0,
                bytes
            );
            let keys: Vec<&String> = ours["response"].as_object().unwrap().keys().collect();
            assert!(keys.contains(&&"patch".to_owned()), "{ours}");
        }
        // Without a patch: exactly kube's text.
        let response = invalid_response("u", "no");
        assert_eq!(
            encode_review(response.clone()).unwrap(),
            serde_json::to_vec(&into_v1_review(response)).unwrap()
        );
    }

    #[test]
    fn encodes_v1_review_with_uid() {
        let review = into_v1_review(invalid_response("abc", "nope"));
        let value = serde_json::to_value(&review).unwrap();
        assert_eq!(value["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(value["kind"], "AdmissionReview");
        assert_eq!(value["response"]["uid"], "abc");
        assert_eq!(value["response"]["allowed"], false);
        assert_eq!(value["response"]["status"]["message"], "nope");
        assert_eq!(value["response"]["status"]["reason"], "InvalidRequest");
    }
}
