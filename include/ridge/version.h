/* Ridge version numbers. Kept in step with project(VERSION) in CMakeLists.txt. */
#ifndef RIDGE_VERSION_H
#define RIDGE_VERSION_H

#define RIDGE_MAJOR 0
#define RIDGE_MINOR 1
#define RIDGE_PATCH 0
/** major*10000 + minor*100 + patch, as returned by ridgeGetVersion. */
#define RIDGE_VERSION_CODE (RIDGE_MAJOR * 10000 + RIDGE_MINOR * 100 + RIDGE_PATCH)

#endif /* RIDGE_VERSION_H */
