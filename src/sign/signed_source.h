// A signed remote object (sign/shards.h's verified_source, from a bundle):
// what Archive::open(Source) reads through with OpenOptions::signature, and
// what verify_signature hashes in full for a URL.
#pragma once

#include <memory>

#include "treecask/signing.h"
#include "treecask/source.h"
#include "sign/bundle.h"

namespace treecask::sig {

// `source` behind verified_source, after the bundle's envelope is checked
// and the object found in its statement (resource_of, by source->name()).
// The signed length: the end of the object's last shard (shard
// serialization), else the object's own (learned with a first read when the
// source does not know it yet). Throws Error(kSignature) as check_bundle,
// resource_of and shard_table do, and what the source throws.
std::shared_ptr<const Source> signed_source(std::shared_ptr<const Source> source, const SignatureCheck& check);

// The same for resource `resource` of the checked statement `st` (a file of
// a signed directory, by its path in it).
std::shared_ptr<const Source> signed_source(std::shared_ptr<const Source> source, const Statement& st,
                                            const std::string& resource);

// Fetches and hashes every signed byte of `source` (a signed_source) in
// stretches of 16 MiB, up to min(concurrency(), 8, threads) at once. Throws
// Error(kSignature) naming the first range that does not match.
void verify_all(const Source& signed_source, unsigned threads);

}  // namespace treecask::sig
