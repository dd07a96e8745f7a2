//! Which user the store's Pods run as: the operator's `--store-image-user` rules.
//!
//! The rendered leader and member Pods set `runAsNonRoot: true`, which the published store
//! images satisfy (their user is uid 65532). The kubelet refuses to start a container under
//! `runAsNonRoot` whose image runs as root, or names its user by name (it cannot tell whether
//! that name is root): the Pod stays in `CreateContainerConfigError`. Other builds of the store
//! (a local build, a vendor image) often do one or the other.
//!
//! The operator (not the backend's author: a user without access to the operator's flags cannot
//! loosen what it renders) names such images with rules `PATTERN=USER`:
//!
//! - `PATTERN` is the start of an image reference (`registry.example.com/mooncake` matches
//!   `registry.example.com/mooncake:0.3.13` and `registry.example.com/mooncake-cuda@sha256:...`),
//!   or `*` for every image;
//! - `USER` is a numeric non-root uid (`1000`): the Pod runs as that uid (`runAsUser`), and
//!   `runAsNonRoot` stays, so an image that names its user by name starts, as that uid;
//! - or `image`: the Pod runs as whatever user the image names, root included, so it sets no
//!   `runAsNonRoot` (and no longer passes the `restricted` Pod Security level). Every other
//!   restriction stays: seccomp `RuntimeDefault`, no privilege escalation, capabilities dropped.
//!
//! The first rule whose pattern matches a Pod's image decides for that Pod; images no rule
//! matches keep the restricted default. A group's own `securityContext` is still merged over the
//! result, container by container. The tier cleanup Pods are not affected: they always run as
//! uid 0 with only `DAC_OVERRIDE` (see [`crate::teardown::cleanup_pod`]).

use std::fmt;
use std::str::FromStr;

/// The controller flag that carries the rules.
pub const FLAG: &str = "--store-image-user";

/// What a [`ImageUser`] rule runs a matching image as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreUser {
    /// The image's own user, root included: no `runAsNonRoot`.
    Image,
    /// This non-root uid (`runAsUser`), with `runAsNonRoot` kept.
    Uid(i64),
}

/// One `PATTERN=USER` rule (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageUser {
    /// The start of the image references it applies to; `*` is every image.
    pub pattern: String,
    /// What those images run as.
    pub user: StoreUser,
}

/// Why a rule cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageUserError {
    /// No `=`.
    #[error(
        "{rule:?} is not PATTERN=USER (for example registry.example.com/mooncake=1000, or '*=image')"
    )]
    Shape {
        /// The rule as given.
        rule: String,
    },
    /// An empty pattern, or one with whitespace.
    #[error(
        "{rule:?}: the pattern must be the start of an image reference, or *, without whitespace"
    )]
    Pattern {
        /// The rule as given.
        rule: String,
    },
    /// The user is neither `image` nor a non-root uid.
    #[error(
        "{rule:?}: the user must be a numeric uid above 0 (up to 2147483647), or \"image\" to run as the image's own user (root included)"
    )]
    User {
        /// The rule as given.
        rule: String,
    },
}

impl FromStr for ImageUser {
    type Err = ImageUserError;

    fn from_str(rule: &str) -> Result<Self, Self::Err> {
        let (pattern, user) = rule.rsplit_once('=').ok_or_else(|| ImageUserError::Shape {
            rule: rule.to_owned(),
        })?;
        if pattern.is_empty() || pattern.chars().any(char::is_whitespace) {
            return Err(ImageUserError::Pattern {
                rule: rule.to_owned(),
            });
        }
        let user = match user {
            "image" => StoreUser::Image,
            uid => match uid.parse::<i64>() {
                Ok(uid) if uid > 0 && uid <= i64::from(i32::MAX) && !uid_text_padded(user) => {
                    StoreUser::Uid(uid)
                }
                _ => {
                    return Err(ImageUserError::User {
                        rule: rule.to_owned(),
                    });
                }
            },
        };
        Ok(Self {
            pattern: pattern.to_owned(),
            user,
        })
    }
}

/// `+5` or `05` parse as numbers but are not how a uid is written.
fn uid_text_padded(text: &str) -> bool {
    text.starts_with('+') || (text.len() > 1 && text.starts_with('0'))
}

impl fmt::Display for ImageUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.user {
            StoreUser::Image => write!(f, "{}=image", self.pattern),
            StoreUser::Uid(uid) => write!(f, "{}={uid}", self.pattern),
        }
    }
}

impl ImageUser {
    /// Whether the rule applies to `image`.
    pub fn matches(&self, image: &str) -> bool {
        self.pattern == "*" || image.starts_with(&self.pattern)
    }
}

/// The user `image` runs as under `rules`: the first matching rule's, `None` for the restricted
/// default.
pub fn user_for(rules: &[ImageUser], image: &str) -> Option<StoreUser> {
    rules.iter().find(|r| r.matches(image)).map(|r| r.user)
}

/// Whether a kubelet message is the refusal of `runAsNonRoot` (an image running as root, or
/// naming its user by name).
pub fn is_run_as_non_root_refusal(message: &str) -> bool {
    message.contains("runAsNonRoot")
}

/// What to do about a `runAsNonRoot` refusal of `image`, for a status message.
pub fn run_as_non_root_hint(image: &str) -> String {
    format!(
        "the image {image:?} runs as root or names its user by name, which runAsNonRoot refuses: \
         run the controller with {FLAG} '{image}=<uid>' (a non-root uid the image works as) or \
         '{image}=image' (its own user, root included), or set runAsUser in this group's \
         securityContext (docs/kvcache-local-disk.md, \"Images that run as root\")"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> ImageUser {
        text.parse().unwrap()
    }

    #[test]
    fn rules_read_and_print_back() {
        assert_eq!(
            rule("registry.example.com/mooncake=1000"),
            ImageUser {
                pattern: "registry.example.com/mooncake".into(),
                user: StoreUser::Uid(1000)
            }
        );
        assert_eq!(rule("*=image").user, StoreUser::Image);
        // The last '=' splits, so a pattern may hold one (a digest never does, a tag never
        // does; this only keeps the rule readable).
        assert_eq!(rule("a=b=image").pattern, "a=b");
        for text in [
            "registry.example.com/mooncake=1000",
            "*=image",
            "x:1=2147483647",
        ] {
            assert_eq!(rule(text).to_string(), text);
        }
    }

    #[test]
    fn bad_rules_say_what_is_expected() {
        for (text, needle) in [
            ("registry.example.com/mooncake", "is not PATTERN=USER"),
            ("=1000", "the pattern must be"),
            ("a b=1000", "the pattern must be"),
            ("x=0", "above 0"),
            ("x=-1", "above 0"),
            ("x=root", "above 0"),
            ("x=", "above 0"),
            ("x=+5", "above 0"),
            ("x=05", "above 0"),
            ("x=2147483648", "above 0"),
            ("x=Image", "above 0"),
        ] {
            let err = text.parse::<ImageUser>().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let rules = [rule("registry.example.com/mooncake=1000"), rule("*=image")];
        assert_eq!(
            user_for(&rules, "registry.example.com/mooncake:0.3.13"),
            Some(StoreUser::Uid(1000))
        );
        assert_eq!(
            user_for(&rules, "registry.example.com/mooncake-cuda@sha256:00"),
            Some(StoreUser::Uid(1000))
        );
        assert_eq!(
            user_for(&rules, "docker.io/other:1"),
            Some(StoreUser::Image)
        );
        assert_eq!(user_for(&rules[..1], "docker.io/other:1"), None);
        assert_eq!(user_for(&[], "docker.io/kvcacheai/mooncake:0.3.13"), None);
    }

    #[test]
    fn the_hint_names_the_image_and_both_ways_out() {
        let hint = run_as_non_root_hint("repo/store:1");
        assert!(
            hint.contains("--store-image-user 'repo/store:1=<uid>'"),
            "{hint}"
        );
        assert!(hint.contains("'repo/store:1=image'"), "{hint}");
        assert!(hint.contains("securityContext"), "{hint}");
        assert!(is_run_as_non_root_refusal(
            "container has runAsNonRoot and image will run as root (pod: \"a\", container: member)"
        ));
        assert!(is_run_as_non_root_refusal(
            "container has runAsNonRoot and image has non-numeric user (mooncake), cannot verify user is non-root"
        ));
        assert!(!is_run_as_non_root_refusal("secret \"x\" not found"));
    }
}
