/* The start-up probes (probes.h): read_probe.c's memory bandwidth and storage.c's storage
 * bandwidth, each in its frame. */
#include "probes.h"

#include "../../app/protocol.h"
#include "../../runtime/image_loader.h"
#include "model_def.h"
#include "read_probe.h"
#include "storage.h"

int run_probes(const Options *opt, const ColibriRequest *req)
{
    if (req->probe_mib >= 0) {
        ReadProbe probe;
        uint64_t mib = req->probe_mib > 0 ? (uint64_t)req->probe_mib : read_probe_default_mib();
        if (read_probe_run(req->threads, mib, opt->resident, &probe) != 0) {
            colibri_report_error(COLIBRI_ERR_REQUEST, "the bandwidth probe failed (no child process or no memory for its buffer)");
            return -1;
        }
        proto_begin("bandwidth");
        proto_u64("read_bw", probe.bytes_per_s);
        proto_u64("mib", probe.mib);
        proto_u64("threads", (uint64_t)probe.threads);
        proto_u64("passes", (uint64_t)probe.passes);
        proto_u64("huge_pages", (uint64_t)probe.huge_pages);
        proto_end();
    }
    if (opt->probe_storage_mib > 0) {
        /* Reads the size of an expert slot at a time, as the cache does. */
        const uint64_t chunk = COLIBRI_EXPERT_SLOT_BYTES > 0 ? COLIBRI_EXPERT_SLOT_BYTES : (1u << 20);
        StorageProbe probe;
        if (storage_probe_run(opt->weights_path, opt->probe_storage_mib, chunk, &probe) != 0) {
            colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the weight image file (storage probe)");
            return -1;
        }
        proto_begin("storage");
        proto_u64("read_bw", probe.bytes_per_s);
        proto_u64("bytes", probe.bytes);
        proto_u64("chunk", probe.chunk);
        proto_u64("direct", (uint64_t)probe.direct);
        proto_end();
    }
    return 0;
}
