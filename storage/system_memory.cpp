#include "storage/system_memory.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace moestream::storage {

uint64_t available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (in >> key >> kib) {
        std::getline(in, unit);
        if (key == "MemAvailable:") return kib * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

}  // namespace moestream::storage
